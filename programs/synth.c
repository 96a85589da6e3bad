/* synth.c: writes synthetic checkpoints in parallel, slab by slab. Every
 * slab is a run of whole checksum blocks of one piece, generated straight in
 * the piece's stored layout (padding zero) from the logical indices. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "../common/memory.h"
#include "../common/parallel.h"
#include "../kernels/kernels.h"
#include "../ckpt/ckpt.h"
#include "synth.h"

#define SLAB_TARGET_BYTES ((int64_t)4 << 20)

uint64_t synth_name_hash(const char *seed_name)
{
    return XXH3_64bits(seed_name, strlen(seed_name));
}

void synth_fill(uint64_t seed, uint64_t name_hash, float mean, float scale, int64_t first,
                int64_t n, float *out)
{
    uint64_t key = (seed * 0x9E3779B97F4A7C15ull) ^ name_hash;
    for (int64_t k = 0; k < n; k++) {
        uint64_t z = key + (uint64_t)(first + k + 1) * 0xD1B54A32D192ED03ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        float u = (float)((int32_t)(z >> 40) - 8388608) * (1.0f / 8388608.0f);
        float t = scale * u;
        out[k] = mean + t;
    }
}

typedef struct {
    int tensor, piece;
    int64_t row_start, row_count;
} slab;

typedef struct {
    ckpt_writer *writer;
    const ckpt_layout *layout;
    const synth_tensor *tensors;
    const int *ids;
    const uint64_t *hashes;
    slab *slabs;
    const synth_options *options;
    float **scratch;   /* per thread: fp32 values of one slab */
    void **converted;  /* per thread: the slab in its stored dtype */
} synth_job;

typedef struct {
    uint64_t seed, hash;
    float mean, scale;
    float *out;
} fill_ctx;

static int fill_run(void *ctx, int64_t offset, int64_t logical_first, int64_t n)
{
    fill_ctx *f = ctx;
    if (logical_first < 0) memset(f->out + offset, 0, (size_t)n * sizeof(float));
    else synth_fill(f->seed, f->hash, f->mean, f->scale, logical_first, n, f->out + offset);
    return 0;
}

/* Generates rows [r0, r1) of a piece in stored layout into out (fp32). */
static void generate_rows(const synth_job *job, const slab *s, float *out)
{
    const synth_tensor *st = &job->tensors[s->tensor];
    fill_ctx f = {job->options->seed, job->hashes[s->tensor], st->mean, st->scale, out};
    ckpt_piece_element_runs(&st->desc, job->layout->tp, s->piece, s->row_start, s->row_start + s->row_count,
                            fill_run, &f);
}

static int write_slab(void *ctx, int64_t i, int thread)
{
    synth_job *job = ctx;
    const slab *s = &job->slabs[i];
    const ckpt_tensor_desc *t = &job->tensors[s->tensor].desc;
    int64_t shape[CKPT_MAX_DIMS];
    ckpt_piece_shape(t, job->layout->tp, shape);
    int64_t elements = s->row_count;
    for (int d = 1; d < t->ndim; d++) elements *= shape[d];
    float *values = job->scratch[thread];
    generate_rows(job, s, values);
    const void *data = values;
    if (t->dtype != TP_FP32) {
        convert_from_f32(values, job->converted[thread], t->dtype, elements);
        data = job->converted[thread];
    }
    int status = ckpt_writer_put_rows(job->writer, job->ids[s->tensor], s->piece, s->row_start,
                                      s->row_count, data);
    if (!status && job->options->on_bytes)
        job->options->on_bytes(job->options->ctx, elements * (int64_t)tp_dtype_size(t->dtype));
    return status;
}

int synth_write(const char *path, const ckpt_layout *layout, const ckpt_write_options *write_options,
                const synth_tensor *tensors, int count, const ckpt_train_state *state,
                const synth_options *options)
{
    ckpt_writer *writer = NULL;
    int status = ckpt_writer_create(&writer, path, layout, write_options);
    if (status) return status;
    int threads = options->threads > 0 ? options->threads : parallel_cpu_count();
    int *ids = calloc((size_t)count + 1, sizeof *ids);
    uint64_t *hashes = calloc((size_t)count + 1, sizeof *hashes);
    slab *slabs = NULL;
    int64_t num_slabs = 0, capacity = 0, max_slab_elements = 1;
    float **scratch = calloc((size_t)threads, sizeof *scratch);
    void **converted = calloc((size_t)threads, sizeof *converted);
    if (!ids || !hashes || !scratch || !converted) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < count && !status; i++) {
        status = ckpt_writer_add_tensor(writer, &tensors[i].desc, &ids[i]);
        if (status) break;
        hashes[i] = synth_name_hash(tensors[i].seed_name ? tensors[i].seed_name : tensors[i].desc.name);
        int64_t shape[CKPT_MAX_DIMS], row_elements = 1;
        ckpt_piece_shape(&tensors[i].desc, layout->tp, shape);
        for (int d = 1; d < tensors[i].desc.ndim; d++) row_elements *= shape[d];
        int64_t block_rows = ckpt_writer_block_rows(writer, ids[i]);
        int64_t blocks_per_slab = SLAB_TARGET_BYTES / (block_rows * row_elements * 4);
        if (blocks_per_slab < 1) blocks_per_slab = 1;
        int64_t slab_rows = blocks_per_slab * block_rows;
        if (slab_rows > shape[0]) slab_rows = shape[0];
        if (slab_rows * row_elements > max_slab_elements) max_slab_elements = slab_rows * row_elements;
        for (int p = 0; p < ckpt_piece_count(&tensors[i].desc, layout->tp); p++) {
            for (int64_t r = 0; r < shape[0]; r += slab_rows) {
                if (num_slabs == capacity) {
                    capacity = capacity ? 2 * capacity : 1024;
                    slab *grown = realloc(slabs, (size_t)capacity * sizeof *grown);
                    if (!grown) {
                        status = tp_fail(TP_ERR_NOMEM, "out of memory");
                        break;
                    }
                    slabs = grown;
                }
                slabs[num_slabs++] = (slab){i, p, r, shape[0] - r < slab_rows ? shape[0] - r : slab_rows};
            }
        }
    }
    for (int t = 0; t < threads && !status; t++) {
        scratch[t] = alloc_pages((size_t)max_slab_elements * sizeof(float));
        converted[t] = alloc_pages((size_t)max_slab_elements * sizeof(uint16_t));
        if (!scratch[t] || !converted[t])
            status = tp_fail(TP_ERR_NOMEM, "out of memory for %lld-element slabs",
                               (long long)max_slab_elements);
    }
    if (!status) {
        synth_job job = {writer, layout, tensors, ids, hashes, slabs, options, scratch, converted};
        status = parallel_for(num_slabs, threads, write_slab, &job);
    }
    for (int t = 0; t < threads && scratch && converted; t++) {
        free(scratch[t]);
        free(converted[t]);
    }
    free(scratch);
    free(converted);
    free(slabs);
    free(hashes);
    free(ids);
    if (status) {
        ckpt_writer_abort(writer);
        return status;
    }
    return ckpt_writer_commit(writer, state);
}

/* --------------------------------------------------------------- GPT model */

int synth_gpt_bytes(const gpt_config *config, const ckpt_layout *layout, int optimizer, int64_t *bytes)
{
    gpt_tensor *catalog = NULL;
    int count = 0;
    TP_TRY(gpt_catalog(config, optimizer, &catalog, &count));
    *bytes = 0;
    for (int i = 0; i < count; i++) *bytes += ckpt_padded_bytes(&catalog[i].desc, layout->tp);
    free(catalog);
    return TP_OK;
}

int synth_gpt(const char *path, const gpt_config *config, const ckpt_layout *layout,
              const ckpt_write_options *write_options, const synth_gpt_options *options, int *tensors_written)
{
    gpt_tensor *catalog = NULL;
    int count = 0;
    TP_TRY(gpt_catalog(config, options->optimizer, &catalog, &count));
    synth_tensor *tensors = calloc((size_t)count, sizeof *tensors);
    char *model_json = gpt_config_to_json(config);
    char schedule[256], *rng = malloc((size_t)layout->tp * layout->pp * 96 + 16);
    int status = tensors && model_json && rng ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < count && !status; i++) {
        const gpt_tensor *g = &catalog[i];
        synth_tensor *s = &tensors[i];
        s->desc = g->desc;
        s->seed_name = g->desc.name;
        float scale = g->init_std > 0 ? g->init_std : 0.02f;
        switch (g->role) {
        case GPT_ROLE_PARAM: s->mean = g->init_mean; s->scale = scale; break;
        case GPT_ROLE_MASTER: s->seed_name = g->param; s->mean = g->init_mean; s->scale = scale; break;
        case GPT_ROLE_EXP_AVG: s->mean = 0; s->scale = 1e-3f; break;
        case GPT_ROLE_EXP_AVG_SQ: s->mean = 1e-6f; s->scale = 1e-6f; break;
        }
    }
    if (!status) {
        /* A plausible training state: cosine schedule, a random state per rank. */
        snprintf(schedule, sizeof schedule,
                 "{\"kind\":\"cosine\",\"lr\":0.0003,\"min_lr\":0.00003,\"warmup\":100,\"step\":%lld}",
                 (long long)options->step);
        int n = sprintf(rng, "[");
        for (int p = 0; p < layout->pp; p++)
            for (int t = 0; t < layout->tp; t++)
                n += sprintf(rng + n, "%s{\"pp\":%d,\"tp\":%d,\"dp\":0,\"state\":\"%016llx\"}", p || t ? "," : "", p,
                             t, (unsigned long long)(options->seed * 0x9E3779B97F4A7C15ull + (uint64_t)(p * 4096 + t)));
        sprintf(rng + n, "]");
        ckpt_train_state state = {options->step, options->step * 512, model_json, schedule, rng, "{\"synthetic\":true}"};
        synth_options so = {options->seed, options->threads, options->on_bytes, options->ctx};
        status = synth_write(path, layout, write_options, tensors, count, &state, &so);
    }
    if (!status && tensors_written) *tensors_written = count;
    free(rng);
    free(model_json);
    free(tensors);
    free(catalog);
    return status;
}
