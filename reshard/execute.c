/* execute.c: carrying out a plan. Worker threads take slabs in file order;
 * each reads its source rows (the reader verifies their checksums and asks
 * the kernel to read ahead), moves and converts them, and writes the output
 * rows (the writer hashes and, if asked, compresses them), so reading,
 * transforming and writing of different slabs overlap. The CPU executor
 * reads straight into the output buffer when a slab needs no moves; the
 * CUDA executor runs every slab's moves on the GPU from pinned buffers. */
#include <cjson/cJSON.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/memory.h"
#include "../common/parallel.h"
#include "internal.h"

typedef struct {
    reshard_plan *plan;
    ckpt_writer *writer;
    int *ids;             /* writer tensor id of every plan tensor */
    char **staging;       /* per thread, CPU executor */
    char **output;
    cuda_mover **movers;  /* per thread, CUDA executor */
    slab_ops *ops;        /* per thread */
    /* Per plan tensor: finite values its narrowing made infinite, summed
     * over its slabs (lock held to add; only slabs with some take it). The
     * run fails on them before the commit: an infinity is no resharding. */
    convert_overflow *overflow;
    pthread_mutex_t overflow_lock;
} exec_job;

/* HDF5 allocates and frees many small objects while opening datasets; the
 * freed memory stays in the allocator's heaps, fragmented, and resident
 * memory would grow with the number of tensors (113 MB after touching the
 * 8000 pieces of a 1B-parameter checkpoint, 16 MB live). Returning it every
 * few slabs keeps the process within its memory limit. */
#define TRIM_EVERY_SLABS 32

static int run_slab(void *ctx, int64_t k, int thread)
{
    exec_job *job = ctx;
    if (k % TRIM_EVERY_SLABS == 0) malloc_trim(0);
    const reshard_plan *plan = job->plan;
    const slab *s = &plan->slabs[k];
    const tensor_plan *t = &plan->tensors[s->tensor];
    const ckpt_tensor_desc *src = ckpt_reader_tensor(plan->source, t->source);
    slab_ops *ops = &job->ops[thread];
    int status = reshard_slab_ops(plan, s, ops);
    if (status) return status;
    size_t src_size = tp_dtype_size(src->dtype), out_size = tp_dtype_size(t->out.desc.dtype);
    int cuda = plan->use_cuda;
    char *staging = cuda ? cuda_mover_staging(job->movers[thread]) : job->staging[thread];
    char *output = cuda ? cuda_mover_output(job->movers[thread]) : job->output[thread];
    /* Equal dtypes and no moves but identities: read where the output wants it. */
    char *target = !cuda && ops->direct && src->dtype == t->out.desc.dtype ? output : staging;
    size_t target_size = target == output ? (size_t)plan->max_output_bytes : (size_t)plan->max_staging_bytes;
    for (int64_t r = 0; r < ops->num_reads && !status; r++) {
        const read_op *op = &ops->reads[r];
        size_t offset = (size_t)op->staging * src_size;
        status = ckpt_reader_read_rows(plan->source, t->source, op->piece, op->row0, op->row1 - op->row0,
                                       target + offset, target_size - offset);
        if (status) return status;
    }
    convert_overflow overflow = {0, 0.0f};
    if (cuda) {
        status = cuda_mover_run(job->movers[thread], (size_t)ops->staging_elements * src_size, src->dtype,
                                (size_t)ops->output_elements * out_size, t->out.desc.dtype, ops->moves, ops->num_moves,
                                &overflow);
        if (status) return tp_fail_context(status, "tensor %s: GPU", t->out.name);
    } else if (target == output) {
        for (int64_t m = 0; m < ops->num_moves; m++) /* only the zero fills remain */
            if (ops->moves[m].src < 0) moves_apply(NULL, TP_FP32, output, t->out.desc.dtype, &ops->moves[m], 1);
    } else {
        overflow = moves_apply(staging, src->dtype, output, t->out.desc.dtype, ops->moves, ops->num_moves);
    }
    if (overflow.count) { /* the whole tensor's count is said at the end; writing on costs nothing committed */
        pthread_mutex_lock(&job->overflow_lock);
        convert_overflow_add(&job->overflow[s->tensor], overflow);
        pthread_mutex_unlock(&job->overflow_lock);
    }
    int64_t rows = s->row1 - s->row0;
    int first = s->piece >= 0 ? s->piece : 0, last = s->piece >= 0 ? s->piece : plan->to.tp - 1;
    for (int p = first; p <= last && !status; p++) {
        const char *data = output + (size_t)((p - first) * rows * t->out_row) * out_size;
        status = ckpt_writer_put_rows(job->writer, job->ids[s->tensor], p, s->row0, rows, data);
        if (status) return status;
    }
    if (plan->options.on_bytes)
        plan->options.on_bytes(plan->options.progress_ctx, ops->output_elements * (int64_t)out_size);
    return TP_OK;
}

/* The first tensor (in plan order) whose values overflowed its output
 * dtype, with a count of the others. */
static int overflow_status(const reshard_plan *plan, const convert_overflow *overflow)
{
    int others, first = convert_overflow_first(overflow, plan->num_tensors, &others);
    if (first < 0) return TP_OK;
    const tensor_plan *t = &plan->tensors[first];
    return convert_overflow_check(overflow[first], t->out.desc.dtype, t->out.name, others);
}

/* The NaNs and infinities the writer counted in the output of a foreign
 * source, said of the source's tensors: the output's logical tensors are
 * the source's, so the first's index is its index in the source, and the
 * file named the one that holds it (a rank file, a DCP data file). */
static int nonfinite_status(const reshard_plan *plan, ckpt_writer *writer, const int *ids)
{
    ckpt_nonfinite found;
    ckpt_nonfinite_init(&found);
    for (int i = 0; i < plan->num_tensors; i++) {
        convert_nonfinite counted = ckpt_writer_nonfinite(writer, ids[i]);
        if (!counted.nans && !counted.infinities) continue;
        int source = plan->tensors[i].source;
        const ckpt_tensor_desc *src = ckpt_reader_tensor(plan->source, source);
        ckpt_nonfinite_note(&found, ckpt_reader_element_file(plan->source, source, counted.first), src->name,
                            src->shape, src->ndim, counted);
    }
    if (plan->options.nonfinite) *plan->options.nonfinite = found;
    return ckpt_nonfinite_check(&found, plan->options.allow_nonfinite, "written", "carries");
}

/* The source's training state, with the model's dtype updated when the
 * parameters change dtype, and a note of where the checkpoint came from. */
static int output_state(const reshard_plan *plan, ckpt_train_state *out, char **model, char **user)
{
    const ckpt_train_state *in = ckpt_reader_state(plan->source);
    *out = *in;
    cJSON *m = cJSON_Parse(in->model_json), *u = cJSON_Parse(in->user_json);
    if (!m || !u) {
        cJSON_Delete(m);
        cJSON_Delete(u);
        return tp_fail(TP_ERR_FORMAT, "source training state is not valid JSON");
    }
    if (plan->options.param_dtype >= 0 && cJSON_IsString(cJSON_GetObjectItem(m, "dtype")))
        cJSON_ReplaceItemInObject(m, "dtype", cJSON_CreateString(tp_dtype_name((tp_dtype)plan->options.param_dtype)));
    cJSON_DeleteItemFromObject(u, "reshard");
    cJSON *note = cJSON_AddObjectToObject(u, "reshard");
    cJSON_AddStringToObject(note, "source", ckpt_reader_path(plan->source));
    cJSON_AddNumberToObject(note, "from_tp", plan->summary.from.tp);
    cJSON_AddNumberToObject(note, "from_pp", plan->summary.from.pp);
    if (ckpt_layout_chunks(&plan->summary.from) > 1)
        cJSON_AddNumberToObject(note, "from_virtual_stages", ckpt_layout_chunks(&plan->summary.from));
    cJSON_AddBoolToObject(note, "optimizer_dropped", plan->options.drop_optimizer);
    *model = cJSON_PrintUnformatted(m);
    *user = cJSON_PrintUnformatted(u);
    cJSON_Delete(m);
    cJSON_Delete(u);
    out->model_json = *model;
    out->user_json = *user;
    return TP_OK;
}

int reshard_execute(reshard_plan *plan, const char *out_path)
{
    const reshard_summary *summary = &plan->summary;
    int threads = summary->threads;
    ckpt_write_options write_options;
    ckpt_write_options_init(&write_options);
    write_options.compress_level = plan->compress_level;
    write_options.overwrite = plan->options.overwrite;
    write_options.update_latest = plan->options.update_latest;
    /* Counted in the digest's pass over what is written: no other pass (docs/BENCHMARKS.md). */
    write_options.count_nonfinite = ckpt_reader_is_foreign(plan->source);
    if (plan->options.nonfinite) ckpt_nonfinite_init(plan->options.nonfinite);
    ckpt_writer *writer = NULL;
    int status = ckpt_writer_create(&writer, out_path, &plan->to, &write_options);
    if (status) return status;

    exec_job job = {plan, writer, calloc((size_t)plan->num_tensors + 1, sizeof(int)),
                    calloc((size_t)threads, sizeof(char *)), calloc((size_t)threads, sizeof(char *)),
                    calloc((size_t)threads, sizeof(cuda_mover *)), calloc((size_t)threads, sizeof(slab_ops)),
                    calloc((size_t)plan->num_tensors + 1, sizeof(convert_overflow)), PTHREAD_MUTEX_INITIALIZER};
    if (!job.ids || !job.staging || !job.output || !job.movers || !job.ops || !job.overflow)
        status = tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < plan->num_tensors && !status; i++)
        status = ckpt_writer_add_tensor(writer, &plan->tensors[i].out.desc, &job.ids[i]);
    malloc_trim(0); /* what declaring every output dataset left behind */
    for (int t = 0; t < threads && !status; t++) {
        if (plan->use_cuda) {
            status = cuda_mover_create(&job.movers[t], (size_t)plan->max_staging_bytes, (size_t)plan->max_output_bytes,
                                       plan->max_moves);
            if (status) tp_fail_context(status, "GPU");
        } else {
            job.staging[t] = alloc_pages((size_t)plan->max_staging_bytes);
            job.output[t] = alloc_pages((size_t)plan->max_output_bytes);
            if (!job.staging[t] || !job.output[t])
                status = tp_fail(TP_ERR_NOMEM, "out of memory for %lld-byte slab buffers",
                                      (long long)plan->max_output_bytes);
        }
    }
    if (!status) status = parallel_for(plan->num_slabs, threads, run_slab, &job);
    status = status ? status : overflow_status(plan, job.overflow);
    for (int t = 0; t < threads && job.ops; t++) {
        if (job.staging) free(job.staging[t]);
        if (job.output) free(job.output[t]);
        if (job.movers) cuda_mover_free(job.movers[t]);
        reshard_slab_ops_free(&job.ops[t]);
    }
    free(job.staging);
    free(job.output);
    free(job.movers);
    free(job.ops);
    free(job.overflow);
    /* What a foreign source records of what was read, whole, before the
     * output appears; then its values (damage is said as damage first). */
    if (!status) status = ckpt_reader_finish_checks(plan->source, NULL);
    if (!status && write_options.count_nonfinite) status = nonfinite_status(plan, writer, job.ids);
    free(job.ids);
    if (status) {
        ckpt_writer_abort(writer);
        return status;
    }
    ckpt_train_state state;
    char *model = NULL, *user = NULL;
    status = output_state(plan, &state, &model, &user);
    if (status) {
        ckpt_writer_abort(writer);
        return status;
    }
    status = ckpt_writer_commit(writer, &state);
    cJSON_free(model);
    cJSON_free(user);
    return status ? status : TP_OK;
}
