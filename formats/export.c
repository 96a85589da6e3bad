/* export.c: merged tensors into safetensors, GGUF and plain HDF5 files.
 *
 * Every format comes down to a header and each tensor's bytes at a known
 * offset of a known file, so export is in two phases: lay out the files
 * (headers written, sizes fixed, every tensor given its file and offset),
 * then stream the data. Streaming cuts each output tensor into bands of
 * output rows sized from the memory limit; a band is read from the
 * checkpoint as a region of the logical tensor (whole verified checksum
 * blocks), converted and, for transposed tensors, transposed in tiles
 * (kernels.h), then written at its offset. Bands of all tensors run on
 * a pool of threads, each with buffers of its own. */
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/buffer.h"
#include "../common/memory.h"
#include "../common/parallel.h"
#include "formats.h"
#include "../kernels/kernels.h"
#include "../reshard/reshard.h"

#define BAND_TARGET_BYTES ((int64_t)8 << 20) /* untransposed bands: enough to keep the disk busy */
#define PAGE_BYTES ((int64_t)4096)
#define GGUF_ALIGNMENT 32                    /* llama.cpp's default general.alignment */
#define GGUF_MAX_NAME 63                     /* llama.cpp refuses names of GGML_MAX_NAME (64) bytes or more */

int export_format_parse(const char *text, export_format *out)
{
    static const char *const names[] = {"safetensors", "gguf", "hdf5"};
    for (int i = 0; i < 3; i++)
        if (strcmp(text, names[i]) == 0) return *out = (export_format)i, TP_OK;
    return tp_fail(TP_ERR_ARG, "unknown format '%s': expected safetensors, gguf or hdf5", text);
}

void export_options_init(export_options *o)
{
    memset(o, 0, sizeof *o);
    o->dtype = -1;
}

typedef struct {
    int source;                     /* index in the reader */
    const export_tensor *spec;
    tp_dtype in, out;             /* stored and written dtypes */
    int ndim;
    int64_t shape[CKPT_MAX_DIMS];   /* as written (transposed when asked) */
    int64_t rows, row_elements;     /* shape[0] and the elements of one row */
    int64_t source_rows;            /* the source's rows written (spec rows), before any transposition */
    int64_t bytes;
    int64_t band_rows;
    int64_t block_rows;             /* transposed: source rows read at a time */
    int64_t per_row;                /* buffer bytes per output row */
    int64_t staging_at;             /* offset of a band's staging in a worker's memory */
    int64_t staging_bytes;
    int file;
    int64_t offset;                 /* of its data in that file */
} out_tensor;

typedef struct {
    int tensor;
    int64_t row0, row1;
} band;

typedef struct {
    unsigned char *memory; /* buffer_bytes: carved per band (out_tensor offsets) */
} worker_buffers;

typedef struct {
    ckpt_reader *source;
    const export_options *o;
    out_tensor *tensors;
    int count;
    band *bands;
    int64_t num_bands;
    int threads;
    int64_t buffer_bytes;  /* per thread: the largest band's output and staging together */
    worker_buffers *buffers;
    /* Files: num_files under staging (safetensors, GGUF), or the HDF5 file. */
    const store_ops *storage;
    store_staged *staged;
    char staging[CKPT_PATH_MAX]; /* its path */
    char (*file_names)[64];
    store_file **files;
    int num_files;
    ckpt_flat_file *flat;
    /* Per tensor: finite values its narrowing made infinite, summed over its
     * bands (lock held to add; only bands with some take it); the export
     * fails on them before anything is published. */
    convert_overflow *overflow;
    pthread_mutex_t overflow_lock;
} exporter;

static int64_t align_up(int64_t n, int64_t a)
{
    return (n + a - 1) / a * a;
}

static const char *safetensors_dtype(tp_dtype dtype)
{
    return dtype == TP_BF16 ? "BF16" : dtype == TP_FP16 ? "F16" : "F32";
}

/* ggml_type ids: F32 0, F16 1, BF16 30. */
static uint32_t ggml_type(tp_dtype dtype)
{
    return dtype == TP_BF16 ? 30 : dtype == TP_FP16 ? 1 : 0;
}

/* ------------------------------------------------------------------- plan */

static int plan_tensors(exporter *x, const export_tensor *specs, int count)
{
    x->tensors = calloc((size_t)count + 1, sizeof *x->tensors);
    if (!x->tensors) return tp_fail(TP_ERR_NOMEM, "out of memory");
    x->count = count;
    for (int i = 0; i < count; i++) {
        out_tensor *t = &x->tensors[i];
        t->spec = &specs[i];
        if (specs[i].values) { /* computed here: [num_values] fp32 */
            t->source = -1;
            t->in = t->out = TP_FP32;
            t->ndim = 1;
            t->shape[0] = t->rows = t->source_rows = specs[i].num_values;
            t->row_elements = 1;
            t->bytes = t->rows * (int64_t)sizeof(float);
            if (specs[i].num_values < 1) return tp_fail(TP_ERR_ARG, "computed tensor %s is empty", specs[i].name);
            continue;
        }
        t->source = ckpt_reader_find(x->source, specs[i].source);
        if (t->source < 0)
            return tp_fail(TP_ERR_NOT_FOUND, "%s: no tensor %s to export as %s", ckpt_reader_path(x->source),
                                specs[i].source, specs[i].name);
        for (int j = 0; j < i; j++)
            if (strcmp(specs[j].name, specs[i].name) == 0)
                return tp_fail(TP_ERR_ARG, "output name %s given twice (for %s and %s)", specs[i].name,
                                    specs[j].source, specs[i].source);
        const ckpt_tensor_desc *d = ckpt_reader_tensor(x->source, t->source);
        t->in = d->dtype;
        t->out = x->o->dtype >= 0 ? (tp_dtype)x->o->dtype : d->dtype;
        /* llama.cpp's converter keeps norms and biases in fp32: many of its
         * kernels take only fp32 there. */
        if (x->o->format == EXPORT_GGUF && d->ndim == 1) t->out = TP_FP32;
        t->ndim = d->ndim;
        memcpy(t->shape, d->shape, sizeof t->shape);
        if (specs[i].rows < 0 || specs[i].rows > d->shape[0])
            return tp_fail(TP_ERR_ARG, "tensor %s has %lld rows; %lld asked", d->name, (long long)d->shape[0],
                           (long long)specs[i].rows);
        if (specs[i].rows) t->shape[0] = specs[i].rows;
        if (specs[i].blocks) {
            /* Output block j is source block blocks[j]: any block of the source. */
            const export_tensor *e = &specs[i];
            int64_t n = e->block_rows > 0 ? t->shape[0] / e->block_rows : 0;
            int64_t source_blocks = e->block_rows > 0 ? d->shape[0] / e->block_rows : 0;
            int valid = n > 0 && n * e->block_rows == t->shape[0];
            for (int64_t j = 0; valid && j < n; j++) valid = e->blocks[j] >= 0 && e->blocks[j] < source_blocks;
            if (!valid)
                return tp_fail(TP_ERR_ARG, "tensor %s: %lld rows do not regroup in blocks of %lld as asked", d->name,
                               (long long)t->shape[0], (long long)e->block_rows);
        }
        t->source_rows = t->shape[0];
        if (specs[i].transpose) {
            if (d->ndim != 2)
                return tp_fail(TP_ERR_ARG, "tensor %s has %d dimensions; only matrices can be transposed",
                                    d->name, d->ndim);
            t->shape[0] = d->shape[1];
            t->shape[1] = t->source_rows;
        }
        if (x->o->format == EXPORT_GGUF && (d->ndim > 4 || strlen(specs[i].name) > GGUF_MAX_NAME))
            return tp_fail(TP_ERR_ARG, "tensor %s cannot be stored in GGUF as %s: %s", d->name, specs[i].name,
                                d->ndim > 4 ? "more than 4 dimensions" : "the name is longer than 63 bytes");
        t->rows = t->shape[0];
        t->row_elements = 1;
        for (int k = 1; k < t->ndim; k++) t->row_elements *= t->shape[k];
        t->bytes = t->rows * t->row_elements * (int64_t)tp_dtype_size(t->out);
    }
    return TP_OK;
}

/* Bands of output rows within the per-thread share of the memory limit
 * (what is left after the resident memory and the reader's scratch).
 * Untransposed bands are at most BAND_TARGET_BYTES. A transposed band (output
 * rows = source columns) takes as much of the share as it can, since each
 * band reads whole source rows: a tensor that fits is read once. It is
 * filled from the source in row blocks of one checksum block each, small
 * enough that the transposition stays in cache. */
static int plan_bands(exporter *x)
{
    const export_options *o = x->o;
    int64_t limit = o->memory_limit > 0 ? o->memory_limit : EXPORT_DEFAULT_MEMORY;
    int64_t widest = 0; /* the most bytes of buffers one output row needs */
    const char *widest_name = "";
    for (int i = 0; i < x->count; i++) {
        out_tensor *t = &x->tensors[i];
        int64_t in_size = (int64_t)tp_dtype_size(t->in), out_size = (int64_t)tp_dtype_size(t->out);
        if (t->spec->transpose) {
            ckpt_piece_info info;
            ckpt_reader_piece_info(x->source, t->source, 0, &info);
            t->block_rows = info.block_rows < t->row_elements ? info.block_rows : t->row_elements;
            t->per_row = t->row_elements * out_size + t->block_rows * in_size; /* an output row, its staging column */
        } else {
            t->per_row = t->row_elements * (out_size + (t->in != t->out ? in_size : 0));
        }
        if (t->per_row > widest) {
            widest = t->per_row;
            widest_name = t->spec->source;
        }
    }
    /* Threads share what the limit leaves after the resident memory, the
     * fixed overhead and each thread's reader scratch (and a page of slack:
     * a band's staging starts on a page); fewer threads when a share would
     * not hold the widest row. */
    int64_t share;
    int threads = reshard_threads_within(limit, o->threads > 0 ? o->threads : parallel_cpu_count(), widest + PAGE_BYTES,
                                         0, &share);
    share -= PAGE_BYTES;
    if (threads < 1)
        return reshard_memory_refusal(limit, widest + PAGE_BYTES, 0, "a row of tensor %s and a page of slack",
                                      widest_name);
    x->num_bands = 0;
    for (int i = 0; i < x->count; i++) {
        out_tensor *t = &x->tensors[i];
        int64_t in_size = (int64_t)tp_dtype_size(t->in), out_size = (int64_t)tp_dtype_size(t->out);
        int64_t target = t->spec->transpose ? share : (share < BAND_TARGET_BYTES ? share : BAND_TARGET_BYTES);
        t->band_rows = target / t->per_row;
        if (t->band_rows > t->rows) t->band_rows = t->rows;
        if (t->band_rows < 1) t->band_rows = 1;
        x->num_bands += (t->rows + t->band_rows - 1) / t->band_rows;
        if (t->spec->transpose) t->staging_bytes = t->block_rows * t->band_rows * in_size;
        else if (t->in != t->out) t->staging_bytes = t->band_rows * t->row_elements * in_size;
        t->staging_at = align_up(t->band_rows * t->row_elements * out_size, PAGE_BYTES);
        if (t->staging_at + t->staging_bytes > x->buffer_bytes) x->buffer_bytes = t->staging_at + t->staging_bytes;
    }
    x->bands = calloc((size_t)x->num_bands + 1, sizeof *x->bands);
    if (!x->bands) return tp_fail(TP_ERR_NOMEM, "out of memory");
    int64_t k = 0;
    for (int i = 0; i < x->count; i++)
        for (int64_t r = 0; r < x->tensors[i].rows; r += x->tensors[i].band_rows) {
            int64_t end = r + x->tensors[i].band_rows;
            x->bands[k++] = (band){i, r, end < x->tensors[i].rows ? end : x->tensors[i].rows};
        }
    x->threads = threads < x->num_bands ? threads : (int)(x->num_bands > 0 ? x->num_bands : 1);
    return TP_OK;
}

/* ----------------------------------------------------------- file layouts */

static int create_files(exporter *x, int num_files)
{
    x->num_files = num_files;
    x->files = calloc((size_t)num_files, sizeof *x->files);
    x->file_names = calloc((size_t)num_files, sizeof *x->file_names);
    if (!x->files || !x->file_names) return tp_fail(TP_ERR_NOMEM, "out of memory");
    return TP_OK;
}

/* Staged path of output file f: under the staging directory, or the
 * staging file itself. */
static void staged_path(const exporter *x, int f, char *out, size_t size)
{
    if (x->file_names[f][0]) snprintf(out, size, "%s/%s", x->staging, x->file_names[f]);
    else snprintf(out, size, "%s", x->staging);
}

/* Opens file f, sized to its final length so data can arrive in any order. */
static int open_file(exporter *x, int f, int64_t size)
{
    char path[CKPT_PATH_MAX + 80];
    staged_path(x, f, path, sizeof path);
    /* The staging file itself exists (store_stage made it): opened, never
     * made again, so that a signal's clean-up that removed it stays done. */
    store_open_mode mode = x->file_names[f][0] ? STORE_OPEN_CREATE : STORE_OPEN_WRITE;
    TP_TRY(x->storage->open(x->storage, path, mode, &x->files[f]));
    return x->storage->resize(x->files[f], size);
}

static int write_at(exporter *x, int f, int64_t offset, const void *data, size_t bytes)
{
    if (x->flat) return ckpt_flat_write(x->flat, offset, data, bytes);
    return x->storage->write_at(x->files[f], data, bytes, offset);
}

static int write_text_file(exporter *x, const char *name, const char *text)
{
    char path[CKPT_PATH_MAX + 80];
    snprintf(path, sizeof path, "%s/%s", x->staging, name);
    store_file *file = NULL;
    TP_TRY(x->storage->open(x->storage, path, STORE_OPEN_CREATE, &file));
    int status = x->storage->write_at(file, text, strlen(text), 0);
    if (!status) status = x->storage->sync(file);
    x->storage->close(file);
    return status;
}

/* safetensors: in list order, a new file whenever the next tensor would take
 * the current one past the shard size (a larger tensor gets a file alone). */
static int layout_safetensors(exporter *x)
{
    const export_options *o = x->o;
    int64_t max = o->max_shard_bytes > 0 ? o->max_shard_bytes : EXPORT_DEFAULT_SHARD_BYTES, used = 0;
    int files = 0;
    for (int i = 0; i < x->count; i++) {
        if (files == 0 || (used > 0 && used + x->tensors[i].bytes > max)) {
            files++;
            used = 0;
        }
        x->tensors[i].file = files - 1;
        x->tensors[i].offset = used; /* within the data section, for now */
        used += x->tensors[i].bytes;
    }
    int status = create_files(x, files);
    for (int f = 0; f < files && !status; f++) {
        if (files == 1) snprintf(x->file_names[f], sizeof x->file_names[f], "model.safetensors");
        else snprintf(x->file_names[f], sizeof x->file_names[f], "model-%05d-of-%05d.safetensors", f + 1, files);
        /* Header: __metadata__ (format, our mark, then the caller's), then the tensors in offset order. */
        cJSON *header = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(header, "__metadata__");
        cJSON_AddStringToObject(meta, "format", "pt");
        cJSON_AddStringToObject(meta, EXPORT_MARK_KEY, EXPORT_MARK);
        for (int k = 0; o->metadata && o->metadata[k] && o->metadata[k + 1]; k += 2)
            cJSON_AddStringToObject(meta, o->metadata[k], o->metadata[k + 1]);
        int64_t data_bytes = 0;
        for (int i = 0; i < x->count; i++) {
            const out_tensor *t = &x->tensors[i];
            if (t->file != f) continue;
            cJSON *entry = cJSON_AddObjectToObject(header, t->spec->name);
            cJSON_AddStringToObject(entry, "dtype", safetensors_dtype(t->out));
            cJSON *shape = cJSON_AddArrayToObject(entry, "shape");
            for (int d = 0; d < t->ndim; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
            cJSON *offsets = cJSON_AddArrayToObject(entry, "data_offsets");
            cJSON_AddItemToArray(offsets, cJSON_CreateNumber((double)t->offset));
            cJSON_AddItemToArray(offsets, cJSON_CreateNumber((double)(t->offset + t->bytes)));
            data_bytes = t->offset + t->bytes;
        }
        char *json = cJSON_PrintUnformatted(header);
        cJSON_Delete(header);
        if (!json) return tp_fail(TP_ERR_NOMEM, "out of memory");
        /* The length, then the JSON padded with spaces to a multiple of 8 bytes
         * (the reference writer's alignment), then the data. */
        size_t length = strlen(json), padded = (length + 7) / 8 * 8;
        char *head = malloc(8 + padded);
        if (!head) {
            cJSON_free(json);
            return tp_fail(TP_ERR_NOMEM, "out of memory");
        }
        uint64_t n = padded;
        memcpy(head, &n, 8); /* little-endian host (ckpt/internal.h) */
        memcpy(head + 8, json, length);
        memset(head + 8 + length, ' ', padded - length);
        cJSON_free(json);
        status = open_file(x, f, (int64_t)(8 + padded) + data_bytes);
        if (!status) status = write_at(x, f, 0, head, 8 + padded);
        free(head);
        for (int i = 0; i < x->count; i++)
            if (x->tensors[i].file == f) x->tensors[i].offset += (int64_t)(8 + padded);
    }
    return status;
}

/* model.safetensors.index.json of a sharded export, as Hugging Face writes
 * it (keys sorted): total tensor bytes and which file holds each tensor. */
static int by_name(const void *a, const void *b)
{
    const out_tensor *const *x = a, *const *y = b;
    return strcmp((*x)->spec->name, (*y)->spec->name);
}

/* The tensor bytes of the output (its files add their headers). */
static int64_t exported_bytes(const exporter *x)
{
    int64_t total = 0;
    for (int i = 0; i < x->count; i++) total += x->tensors[i].bytes;
    return total;
}

static int write_safetensors_index(exporter *x)
{
    const out_tensor **sorted = malloc((size_t)x->count * sizeof *sorted);
    if (!sorted) return tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < x->count; i++) sorted[i] = &x->tensors[i];
    qsort(sorted, (size_t)x->count, sizeof *sorted, by_name);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(root, "metadata"), "total_size", (double)exported_bytes(x));
    cJSON *map = cJSON_AddObjectToObject(root, "weight_map");
    for (int i = 0; i < x->count; i++) cJSON_AddStringToObject(map, sorted[i]->spec->name, x->file_names[sorted[i]->file]);
    free(sorted);
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) return tp_fail(TP_ERR_NOMEM, "out of memory");
    int status = write_text_file(x, "model.safetensors.index.json", text);
    cJSON_free(text);
    return status;
}

static void put_u32(byte_buffer *b, uint32_t v) { buffer_put(b, &v, 4); }
static void put_u64(byte_buffer *b, uint64_t v) { buffer_put(b, &v, 8); }

static void put_string(byte_buffer *b, const char *s)
{
    put_u64(b, strlen(s));
    buffer_put(b, s, strlen(s));
}

enum { GGUF_U32 = 4, GGUF_I32 = 5, GGUF_F32 = 6, GGUF_BOOL = 7, GGUF_STRING = 8, GGUF_ARRAY = 9 };

static void put_kv(byte_buffer *b, const export_kv *kv)
{
    put_string(b, kv->key);
    switch (kv->type) {
    case EXPORT_KV_U32: put_u32(b, GGUF_U32); put_u32(b, kv->u32); break;
    case EXPORT_KV_F32: put_u32(b, GGUF_F32); buffer_put(b, &kv->f32, 4); break;
    case EXPORT_KV_BOOL: {
        uint8_t value = kv->u32 != 0;
        put_u32(b, GGUF_BOOL);
        buffer_put(b, &value, 1);
        break;
    }
    case EXPORT_KV_STRING: put_u32(b, GGUF_STRING); put_string(b, kv->string); break;
    case EXPORT_KV_STRINGS:
        put_u32(b, GGUF_ARRAY);
        put_u32(b, GGUF_STRING);
        put_u64(b, (uint64_t)kv->count);
        for (int64_t i = 0; i < kv->count; i++) put_string(b, kv->strings[i]);
        break;
    case EXPORT_KV_I32S:
        put_u32(b, GGUF_ARRAY);
        put_u32(b, GGUF_I32);
        put_u64(b, (uint64_t)kv->count);
        buffer_put(b, kv->i32s, (size_t)kv->count * 4);
        break;
    }
}

/* GGUF v3: header, key-values, tensor infos (dimensions fastest first),
 * padding to the alignment, then every tensor at the running padded offset. */
static int layout_gguf(exporter *x)
{
    const export_options *o = x->o;
    byte_buffer b = {0};
    buffer_put(&b, "GGUF", 4);
    put_u32(&b, 3);
    put_u64(&b, (uint64_t)x->count);
    put_u64(&b, (uint64_t)o->num_kvs + 2);
    /* Our mark first (what --force looks for), the caller's keys, then general.file_type. */
    export_kv mark = {EXPORT_MARK_KEY, EXPORT_KV_STRING, 0, 0, EXPORT_MARK, NULL, NULL, 0};
    put_kv(&b, &mark);
    for (int i = 0; i < o->num_kvs; i++) put_kv(&b, &o->kvs[i]);
    /* llama_ftype: the type of the matrices (ALL_F32 0, MOSTLY_F16 1, MOSTLY_BF16 32). */
    tp_dtype matrices = TP_FP32;
    for (int i = 0; i < x->count; i++)
        if (x->tensors[i].ndim >= 2) {
            matrices = x->tensors[i].out;
            break;
        }
    export_kv file_type = {"general.file_type", EXPORT_KV_U32, matrices == TP_BF16 ? 32 : matrices == TP_FP16 ? 1 : 0,
                           0, NULL, NULL, NULL, 0};
    put_kv(&b, &file_type);
    int64_t offset = 0;
    for (int i = 0; i < x->count; i++) {
        out_tensor *t = &x->tensors[i];
        put_string(&b, t->spec->name);
        put_u32(&b, (uint32_t)t->ndim);
        for (int d = t->ndim - 1; d >= 0; d--) put_u64(&b, (uint64_t)t->shape[d]);
        put_u32(&b, ggml_type(t->out));
        put_u64(&b, (uint64_t)offset);
        t->file = 0;
        t->offset = offset;
        offset += align_up(t->bytes, GGUF_ALIGNMENT);
    }
    int64_t data_start = align_up((int64_t)b.size, GGUF_ALIGNMENT);
    int status = b.failed ? tp_fail(TP_ERR_NOMEM, "out of memory") : create_files(x, 1);
    if (!status) status = open_file(x, 0, data_start + offset);
    if (!status) status = write_at(x, 0, 0, b.data, b.size);
    for (int i = 0; i < x->count; i++) x->tensors[i].offset += data_start;
    free(b.data);
    return status;
}

/* --------------------------------------------------------------- replacing */

/* What --force replaces is an export of ours, known by its mark
 * (EXPORT_MARK_KEY, formats.h): a file that merely has the format's
 * signature (a checkpoint's shard is an HDF5 file) is not one. Each check
 * reads only the head of a file, through the store (a URL's too), and says
 * in why what the file is when it is not ours. */

/* Reads size bytes at offset 0 of a regular file, when it has them. */
static int read_head(const store_ops *s, const char *path, void *head, size_t size)
{
    store_stat st;
    if (s->stat(s, path, &st) != TP_OK || !st.exists || st.is_dir || st.size < (int64_t)size) return 0;
    store_file *file = NULL;
    int ok = s->open(s, path, STORE_OPEN_READ, &file) == TP_OK && s->read_at(file, head, size, 0) == TP_OK;
    if (file) s->close(file);
    return ok;
}

/* A safetensors file of ours: __metadata__ holds the mark, or, written
 * before there was one, this toolkit's provenance (tp_toolkit.source_layout). */
static int marked_safetensors(const store_ops *s, const char *path, const char *name, char *why, size_t why_size)
{
    store_stat st;
    unsigned char head[8];
    uint64_t n = 0; /* the header's length, little-endian */
    int ok = s->stat(s, path, &st) == TP_OK && read_head(s, path, head, 8);
    for (int i = 7; ok && i >= 0; i--) n = n << 8 | head[i];
    if (!ok || n < 2 || n > SAFETENSORS_MAX_HEADER || n + 8 > (uint64_t)st.size) {
        snprintf(why, why_size, "%s is not a safetensors file", name);
        return 0;
    }
    char *text = malloc((size_t)n);
    store_file *file = NULL;
    ok = text && s->open(s, path, STORE_OPEN_READ, &file) == TP_OK && s->read_at(file, text, (size_t)n, 8) == TP_OK;
    if (file) s->close(file);
    cJSON *header = ok && text[0] == '{' ? cJSON_ParseWithLength(text, (size_t)n) : NULL;
    free(text);
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(header, "__metadata__");
    const cJSON *mark = cJSON_GetObjectItemCaseSensitive(meta, EXPORT_MARK_KEY);
    ok = (cJSON_IsString(mark) && strcmp(mark->valuestring, EXPORT_MARK) == 0) ||
         cJSON_IsString(cJSON_GetObjectItemCaseSensitive(meta, "tp_toolkit.source_layout"));
    int parsed = header != NULL;
    cJSON_Delete(header);
    if (!ok)
        snprintf(why, why_size, "%s %s", name,
                 parsed ? "is a safetensors file without this toolkit's mark, " EXPORT_MARK_KEY " in __metadata__"
                        : "is not a safetensors file");
    return ok;
}

typedef struct {
    const store_ops *storage;
    const char *dir;
    int entries;
    int weights;    /* marked .safetensors files among them */
    char why[400];
} export_scan;

static int visit_export_entry(void *ctx, const char *name)
{
    export_scan *e = ctx;
    char path[CKPT_PATH_MAX + 256];
    size_t n = strlen(name), suffix = strlen(".safetensors");
    snprintf(path, sizeof path, "%s/%s", e->dir, name);
    e->entries++;
    if (strcmp(name, "config.json") == 0 || strcmp(name, "model.safetensors.index.json") == 0) {
        /* Ours by name only when a file: the replaced directory goes whole,
         * so a directory of that name would take everything in it along. */
        store_stat st = {0};
        int status = e->storage->stat(e->storage, path, &st);
        if (!status && (!st.exists || !st.is_dir)) return TP_OK; /* gone meanwhile: nothing to lose */
        snprintf(e->why, sizeof e->why, "its '%s' is %s", name,
                 status ? "an entry that cannot be examined" : "a directory, not an export's file");
        return TP_ERR_EXISTS;
    }
    if (n > suffix && strcmp(name + n - suffix, ".safetensors") == 0) {
        if (!marked_safetensors(e->storage, path, name, e->why, sizeof e->why)) return TP_ERR_EXISTS;
        e->weights++;
        return TP_OK;
    }
    snprintf(e->why, sizeof e->why, "it holds '%s'", name);
    return TP_ERR_EXISTS;
}

/* A safetensors export of ours: a directory of marked weights, config.json
 * and the index, or an empty one. */
static int marked_safetensors_directory(const store_ops *s, const char *path, const store_stat *st, char *why,
                                        size_t why_size)
{
    if (!st->is_dir) return snprintf(why, why_size, "a file, not a directory"), 0;
    export_scan e = {s, path, 0, 0, ""};
    int status = s->list(s, path, visit_export_entry, &e);
    if (status && !e.why[0]) snprintf(e.why, sizeof e.why, "its entries cannot be listed: %s", tp_errmsg());
    /* Empty: nothing to lose; config.json or an index alone: someone else's. */
    if (!status && e.entries > 0 && e.weights == 0)
        snprintf(e.why, sizeof e.why, "it holds no safetensors file of this toolkit's");
    snprintf(why, why_size, "%s", e.why);
    return !status && !e.why[0];
}

/* A GGUF export of ours: the mark is its first key, a string. */
static int marked_gguf(const store_ops *s, const char *path, const store_stat *st, char *why, size_t why_size)
{
    if (st->is_dir) return snprintf(why, why_size, "a directory"), 0;
    byte_buffer want = {0};
    put_string(&want, EXPORT_MARK_KEY);
    put_u32(&want, GGUF_STRING);
    put_string(&want, EXPORT_MARK);
    size_t size = 24 + want.size; /* magic, version, tensor and key counts, the first key */
    unsigned char *head = want.failed ? NULL : malloc(size);
    int gguf = head && read_head(s, path, head, 4) && memcmp(head, "GGUF", 4) == 0;
    int ok = gguf && read_head(s, path, head, size) && memcmp(head + 24, want.data, want.size) == 0;
    free(head);
    free(want.data);
    if (!ok)
        snprintf(why, why_size, "%s", gguf ? "a GGUF file whose first key is not " EXPORT_MARK_KEY ", this toolkit's mark"
                                           : "not a GGUF file");
    return ok;
}

/* An HDF5 export of ours: the root attribute `format` is the mark. Read by
 * HDF5, so from a local file only. */
static int marked_hdf5(const store_ops *s, const char *path, const store_stat *st, char *why, size_t why_size)
{
    static const unsigned char hdf5_magic[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    unsigned char head[8];
    if (st->is_dir) return snprintf(why, why_size, "a directory"), 0;
    if (!read_head(s, path, head, 8) || memcmp(head, hdf5_magic, 8) != 0)
        return snprintf(why, why_size, "not an HDF5 file"), 0;
    if (s != store_posix())
        return snprintf(why, why_size, "an HDF5 file at a URL, whose root attributes cannot be read there to tell "
                                       "whether it is an export of this toolkit's; remove it first"), 0;
    char format[128];
    int status = ckpt_flat_read_attribute(path, "format", format, sizeof format);
    if (status == TP_OK && strcmp(format, EXPORT_MARK) == 0) return 1;
    if (status == TP_OK) snprintf(why, why_size, "an HDF5 file whose root attribute format is '%s', not '%s'", format, EXPORT_MARK);
    else snprintf(why, why_size, "an HDF5 file without the root attribute format = '%s'", EXPORT_MARK);
    return 0;
}

int export_may_replace(const store_ops *s, const char *path, void *ctx)
{
    TP_TRY(ckpt_refuse_run_directory(s, path));
    const export_options *o = ctx;
    store_stat st;
    TP_TRY(s->stat(s, path, &st));
    if (!st.exists) return TP_OK;
    const char *format = o->format == EXPORT_SAFETENSORS ? "a safetensors" : o->format == EXPORT_GGUF ? "a GGUF" : "an HDF5";
    char why[600] = "";
    int ok = o->format == EXPORT_SAFETENSORS ? marked_safetensors_directory(s, path, &st, why, sizeof why)
             : o->format == EXPORT_GGUF      ? marked_gguf(s, path, &st, why, sizeof why)
                                             : marked_hdf5(s, path, &st, why, sizeof why);
    if (ok) return TP_OK;
    return tp_fail(TP_ERR_EXISTS, "%s is not %s export (%s); --force replaces only an earlier "
                   "export in that format", path, format, why);
}

static int layout_hdf5(exporter *x, const char *out_path)
{
    store_stage_options stage = {.overwrite = x->o->overwrite, .may_replace = export_may_replace, .ctx = (void *)x->o,
                                 .bytes = exported_bytes(x)};
    int status = ckpt_flat_create(&x->flat, out_path, &stage);
    if (status) return status;
    for (int i = 0; i < x->count && !status; i++) {
        out_tensor *t = &x->tensors[i];
        t->file = 0;
        status = ckpt_flat_add(x->flat, t->spec->name, t->out, t->ndim, t->shape, &t->offset);
    }
    if (!status) status = ckpt_flat_attribute(x->flat, "format", EXPORT_MARK); /* the mark, then the caller's */
    for (int k = 0; !status && x->o->metadata && x->o->metadata[k] && x->o->metadata[k + 1]; k += 2)
        status = ckpt_flat_attribute(x->flat, x->o->metadata[k], x->o->metadata[k + 1]);
    return status ? status : TP_OK;
}

/* ------------------------------------------------------------------- data */

/* Source rows [start[0], start[0] + count[0]) as the spec orders them
 * (blocks of rows reordered), the other dimensions as start and count say,
 * read densely into buf. */
static int read_rows(exporter *x, const out_tensor *t, const int64_t *start, const int64_t *count, void *buf, size_t size)
{
    const export_tensor *e = t->spec;
    if (!e->blocks) return ckpt_reader_read_region(x->source, t->source, start, count, buf, size);
    size_t row_bytes = tp_dtype_size(t->in);
    for (int d = 1; d < t->ndim; d++) row_bytes *= (size_t)count[d];
    for (int64_t at = 0; at < count[0];) {
        int64_t row = start[0] + at, within = row % e->block_rows;
        int64_t n = count[0] - at < e->block_rows - within ? count[0] - at : e->block_rows - within;
        int64_t from[CKPT_MAX_DIMS], rows[CKPT_MAX_DIMS];
        memcpy(from, start, sizeof from);
        memcpy(rows, count, sizeof rows);
        from[0] = e->blocks[row / e->block_rows] * e->block_rows + within;
        rows[0] = n;
        TP_TRY(ckpt_reader_read_region(x->source, t->source, from, rows, (char *)buf + (size_t)at * row_bytes,
                                       size - (size_t)at * row_bytes));
        at += n;
    }
    return TP_OK;
}

/* Output rows [row0, row1) of a transposed tensor: source columns, read in
 * blocks of source rows; block [r0, r0 + n) x columns lands as a run of n
 * elements in each output row. */
static int transposed_band(exporter *x, const out_tensor *t, const band *b, unsigned char *memory,
                           convert_overflow *overflow)
{
    unsigned char *staging = memory + t->staging_at;
    int64_t R = t->source_rows, columns = b->row1 - b->row0;
    for (int64_t r0 = 0; r0 < R; r0 += t->block_rows) {
        int64_t n = R - r0 < t->block_rows ? R - r0 : t->block_rows;
        int64_t start[CKPT_MAX_DIMS] = {r0, b->row0}, count[CKPT_MAX_DIMS] = {n, columns};
        int status = read_rows(x, t, start, count, staging, (size_t)t->staging_bytes);
        if (status) return tp_fail_context(status, "exporting %s", t->spec->source);
        /* staging [n, columns] -> output[i, r0 .. r0 + n) for each column i */
        convert_overflow_add(overflow, transpose_numbers(staging, t->in, n, columns, columns,
                                                         memory + r0 * (int64_t)tp_dtype_size(t->out), t->out, R));
    }
    return TP_OK;
}

static int export_band(void *ctx, int64_t k, int thread)
{
    exporter *x = ctx;
    const band *b = &x->bands[k];
    const out_tensor *t = &x->tensors[b->tensor];
    unsigned char *output = x->buffers[thread].memory, *staging = output + t->staging_at;
    int64_t rows = b->row1 - b->row0, elements = rows * t->row_elements;
    size_t out_size = tp_dtype_size(t->out);
    int status = TP_OK;
    convert_overflow overflow = {0, 0.0f};
    if (t->spec->values) {
        memcpy(output, t->spec->values + b->row0, (size_t)elements * sizeof(float));
    } else if (t->spec->transpose) {
        status = transposed_band(x, t, b, output, &overflow);
    } else {
        int converts = t->in != t->out;
        const ckpt_tensor_desc *d = ckpt_reader_tensor(x->source, t->source);
        int64_t start[CKPT_MAX_DIMS] = {b->row0}, count[CKPT_MAX_DIMS];
        memcpy(count, d->shape, sizeof count);
        count[0] = rows;
        status = read_rows(x, t, start, count, converts ? staging : output,
                           converts ? (size_t)t->staging_bytes : (size_t)elements * out_size);
        if (status) status = tp_fail_context(status, "exporting %s", t->spec->source);
        else if (converts) overflow = convert_numbers(staging, t->in, output, t->out, elements);
    }
    if (overflow.count) { /* said whole at the end; what is written meanwhile is never published */
        pthread_mutex_lock(&x->overflow_lock);
        convert_overflow_add(&x->overflow[b->tensor], overflow);
        pthread_mutex_unlock(&x->overflow_lock);
    }
    if (!status)
        status = write_at(x, t->file, t->offset + b->row0 * t->row_elements * (int64_t)out_size, output,
                          (size_t)elements * out_size);
    if (!status && x->o->on_bytes) x->o->on_bytes(x->o->progress_ctx, elements * (int64_t)out_size);
    return status;
}

/* The first tensor whose values overflowed its written dtype, with a count
 * of the others. */
static int overflow_status(const exporter *x)
{
    int others, first = convert_overflow_first(x->overflow, x->count, &others);
    if (first < 0) return TP_OK;
    const out_tensor *t = &x->tensors[first];
    return convert_overflow_check(x->overflow[first], t->out, t->spec->source, others);
}

static int stream_data(exporter *x)
{
    x->buffers = calloc((size_t)x->threads, sizeof *x->buffers);
    x->overflow = calloc((size_t)x->count + 1, sizeof *x->overflow);
    if (!x->buffers || !x->overflow) return tp_fail(TP_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&x->overflow_lock, NULL);
    for (int i = 0; i < x->threads; i++)
        if (!(x->buffers[i].memory = alloc_pages((size_t)x->buffer_bytes)))
            return tp_fail(TP_ERR_NOMEM, "out of memory for %lld bytes of export buffers",
                                (long long)x->buffer_bytes);
    TP_TRY(parallel_for(x->num_bands, x->threads, export_band, x));
    return overflow_status(x);
}

/* ----------------------------------------------------------------- commit */

static int close_files(exporter *x, int sync)
{
    int status = TP_OK;
    for (int f = 0; f < x->num_files; f++) {
        if (!x->files[f]) continue;
        if (sync && !status) status = x->storage->sync(x->files[f]);
        x->storage->close(x->files[f]);
        x->files[f] = NULL;
    }
    return status;
}

static void free_exporter(exporter *x)
{
    for (int i = 0; x->buffers && i < x->threads; i++) free(x->buffers[i].memory);
    free(x->buffers);
    free(x->overflow);
    free(x->files);
    free(x->file_names);
    free(x->bands);
    free(x->tensors);
}

int export_output_bytes(ckpt_reader *source, const export_tensor *tensors, int count, const export_options *options,
                        int64_t *bytes)
{
    exporter x;
    memset(&x, 0, sizeof x);
    x.source = source;
    x.o = options;
    int status = plan_tensors(&x, tensors, count);
    *bytes = status ? 0 : exported_bytes(&x);
    free_exporter(&x);
    return status;
}

int export_run(ckpt_reader *source, const export_tensor *tensors, int count, const export_options *options,
               const char *out_path, export_summary *summary)
{
    exporter x;
    memset(&x, 0, sizeof x);
    x.source = source;
    x.o = options;
    if (count < 1) return tp_fail(TP_ERR_ARG, "nothing to export");
    int status = store_for(out_path, &x.storage);
    if (!status) status = plan_tensors(&x, tensors, count);
    if (!status) status = plan_bands(&x);
    int staged = 0;
    if (!status && options->format != EXPORT_HDF5) {
        store_stage_options stage = {.directory = options->format == EXPORT_SAFETENSORS,
                                    .overwrite = options->overwrite,
                                    .may_replace = export_may_replace,
                                    .ctx = (void *)x.o,
                                    .bytes = exported_bytes(&x)};
        status = store_stage(x.storage, out_path, &stage, &x.staged);
        if (!status) {
            snprintf(x.staging, sizeof x.staging, "%s", store_staged_path(x.staged));
            staged = 1;
        }
    }
    if (!status) {
        switch (options->format) {
        case EXPORT_SAFETENSORS: status = layout_safetensors(&x); break;
        case EXPORT_GGUF: status = layout_gguf(&x); break;
        case EXPORT_HDF5: status = layout_hdf5(&x, out_path); break;
        }
    }
    if (!status) status = stream_data(&x);
    if (!status && options->format == EXPORT_SAFETENSORS) {
        if (x.num_files > 1) status = write_safetensors_index(&x);
        if (!status && options->config_json) status = write_text_file(&x, "config.json", options->config_json);
    }
    int closed = close_files(&x, !status);
    if (!status) status = closed;
    /* What a foreign source records of what was read, whole, before the output appears. */
    if (!status) status = ckpt_reader_finish_checks(source, NULL);
    if (!status && x.flat) {
        status = ckpt_flat_commit(x.flat);
        x.flat = NULL;
    } else if (!status && staged) {
        status = store_staged_publish(x.staged); /* frees it, whatever the outcome */
        staged = 0;
    }
    if (status) {
        if (x.flat) ckpt_flat_abort(x.flat);
        if (staged) store_staged_discard(x.staged);
    } else if (summary) {
        memset(summary, 0, sizeof *summary);
        summary->tensors = count;
        summary->files = options->format == EXPORT_SAFETENSORS ? x.num_files : 1;
        summary->tensor_bytes = exported_bytes(&x);
        summary->buffer_memory = (int64_t)x.threads * x.buffer_bytes;
        summary->threads = x.threads;
    }
    free_exporter(&x);
    return status;
}
